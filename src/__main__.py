"""``python -m effectful_durable``: the effectful-durable command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
