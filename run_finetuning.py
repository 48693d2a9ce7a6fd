"""Fine-tune a pretrained ELECTRA discriminator on the official tasks (official flags).

Tasks (docs/finetuning.md): GLUE classification (cola, sst, mrpc, qqp, mnli, qnli, rte) and
generic TSV/CSV classification tasks; STS-B regression (sts); question answering: SQuAD 2.0
(squad), SQuAD 1.1 (squadv1) and MRQA (newsqa, naturalqs, triviaqa, searchqa); chunking (chunk).
Reads DATA_DIR/finetuning_data/<task>/, starts from DATA_DIR/models/MODEL_NAME (or the
`init_checkpoint` hparam: a model directory, a checkpoint prefix or an exported SavedModel), and
writes DATA_DIR/models/MODEL_NAME/results/<tasks>_results.{json,txt} (QA predictions in
results/<tasks>_qa/) and the fine-tuned SavedModels (raw-text signatures) to
.../finetuning_models/<tasks>_model_<trial>.

Examples:
  python run_finetuning.py --data-dir pretrain_data --model-name electra_small \\
      --hparams '{"task_names": ["sst"]}'
  python run_finetuning.py --model-name electra_small --hparams '{"task_names": ["squad"]}'
  python run_finetuning.py --model-name electra_small \\
      --hparams '{"task_names": ["chunk"], "num_trials": 3, "layerwise_lr_decay_fix": true}'
  python run_finetuning.py --hparams '{"task_names": ["sts"], "init_checkpoint": "DIR/export/discriminator"}'
"""

import argparse
import os
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Standard library only, so --help stays fast (the work imports TensorFlow).
from electra_tf.cli import run_cli, setup_logging  # noqa: E402
from electra_tf.finetuning.config import HPARAM_NAMES  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    epilog = ("hparams (official configure_finetuning.py names plus electra-tf additions; see "
              "docs/finetuning.md; an unknown key is an error):\n"
              + textwrap.fill(", ".join(HPARAM_NAMES), width=96, initial_indent="  ",
                              subsequent_indent="  ")
              + "\n\nexit status: 0 done, 2 bad input (one line on stderr), 130 interrupted.")
    parser = argparse.ArgumentParser(prog="run_finetuning.py", description=__doc__, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="pretrain_data",
                        help="directory with models/ and finetuning_data/ (default: %(default)s)")
    parser.add_argument("--model-name", default="electra_small",
                        help="the pretrained run, DATA_DIR/models/MODEL_NAME (default: %(default)s)")
    parser.add_argument("--hparams", default=None,
                        help="JSON object of hparams, or the path of a .json file holding one")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing results and fine-tuned models of these tasks")
    parser.add_argument("--quiet", action="store_true", help="log warnings and errors only")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.quiet)

    def work():
        from electra_tf.finetuning.config import FinetuningConfig
        from electra_tf.finetuning.runner import run

        config = FinetuningConfig.create(args.model_name, args.data_dir, args.hparams)
        results = run(config, overwrite=args.overwrite)
        print(f"results: {config.results_json}")
        for trial in results["trials"]:
            if "export" in trial:
                print(f"model (trial {trial['trial']}): {trial['export']}")

    return run_cli("run_finetuning.py", work)


if __name__ == "__main__":
    sys.exit(main())
