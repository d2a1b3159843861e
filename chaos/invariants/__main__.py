import sys

from chaos.invariants.cli import main

sys.exit(main())
