import sys

from prism.bench.cli import main

sys.exit(main())
