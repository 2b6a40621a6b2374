"""`python -m lowbit` = the `lowbit` command."""
import sys

from .cli import main

sys.exit(main())
