import sys

from semserve.cli import main

sys.exit(main())
