"""``python -m effectful_durable``: the effectful-durable command."""

import sys

from .cli import main

sys.exit(main())
