import sys

from semserve.cli import main

sys.exit(main(["predictor", *sys.argv[1:]]))
