"""Builds ELECTRA pretraining TFRecords: `python build_pretraining_dataset.py [--corpus-dir DIR ...]`.

The same tool as the installed `electra-build-dataset` (electra_tf/commands/build_dataset.py);
see `--help` for every flag. With no flags it fetches the default data into pretrain_data/ (if
absent) and builds pretrain_data/pretrain_tfrecords/.
"""

import sys

from electra_tf.commands import build_dataset

PROG = "build_pretraining_dataset.py"


def parse_args(argv):
    return build_dataset.parse_args(argv, PROG)


def main(argv=None):
    return build_dataset.main(argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
