"""Pretrain an ELECTRA model: `python run_pretraining.py --model-size small`.

The same tool as the installed `electra-pretrain` (electra_tf/commands/pretrain.py); see
`--help` for every flag.
"""

import sys

from electra_tf.commands import pretrain

PROG = "run_pretraining.py"


def build_parser():
    return pretrain.build_parser(PROG)


def parse_args(argv=None):
    return pretrain.parse_args(argv, PROG)


def main(argv=None) -> int:
    return pretrain.main(argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
