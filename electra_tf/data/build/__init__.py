"""The dataset build: packing, the held-out split, the global shuffle, shards, locally or on Apache Beam."""
