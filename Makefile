.PHONY: demo test lint format docs bench

demo:  ## run the offline example (sets up .venv on first use)
	bash scripts/demo.sh

test:  ## lint, type-check, run the tests and build the docs
	bash scripts/test.sh

lint:
	bash scripts/lint.sh

format:
	bash scripts/format.sh

docs:
	bash scripts/docs.sh

bench:
	bash -c 'source scripts/env.sh && "$$PYTHON" bench/bench_persistence.py'
