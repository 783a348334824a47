import sys

from headwise.cli import main

sys.exit(main())
