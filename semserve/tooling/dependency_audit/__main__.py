"""`python -m semserve.tooling.dependency_audit ...` is `semserve audit deps ...`."""

import sys

from semserve.tooling.dependency_audit.cli import main

sys.exit(main())
