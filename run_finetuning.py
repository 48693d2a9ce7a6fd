"""Fine-tune a pretrained ELECTRA discriminator: `python run_finetuning.py --hparams '{"task_names": ["sst"]}'`.

The same tool as the installed `electra-finetune` (electra_tf/commands/finetune.py); see
`--help` for every flag.
"""

import sys

from electra_tf.commands import finetune

PROG = "run_finetuning.py"


def build_parser():
    return finetune.build_parser(PROG)


def main(argv=None) -> int:
    return finetune.main(argv, PROG)


if __name__ == "__main__":
    sys.exit(main())
