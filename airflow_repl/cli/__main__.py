"""``python -m airflow_repl.cli``: the ``airflow-repl`` command."""

import sys

from airflow_repl.cli import main

sys.exit(main())
