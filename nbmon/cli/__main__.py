"""``python -m nbmon.cli``: the ``nbmon`` command."""
import sys

from . import main

sys.exit(main())
