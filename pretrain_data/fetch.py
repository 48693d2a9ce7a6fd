"""Fetches the default pretraining data: `python pretrain_data/fetch.py [--offline]`.

The same tool as the installed `electra-fetch` (electra_tf/commands/fetch.py); see `--help`.
"""

import os
import sys

# Run from a checkout without installing the package: the repository root holds electra_tf/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from electra_tf.commands import fetch  # noqa: E402


def main(argv=None) -> int:
    return fetch.main(argv, "fetch")


if __name__ == "__main__":
    sys.exit(main())
