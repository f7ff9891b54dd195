"""`python -m mlxcel.cli`: the `mlxcel` command, for an environment without its script."""

import sys

from mlxcel.cli.main import main

sys.exit(main())
