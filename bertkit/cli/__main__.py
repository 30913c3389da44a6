"""`python -m bertkit.cli ...` (what torchrun launches): the `bertkit` command."""

import sys

from bertkit.cli import main

sys.exit(main())
