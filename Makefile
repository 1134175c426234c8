.PHONY: demo check test lint format docs bench soak faults crash pg-faults screenshots

demo:  ## run the offline example (sets up .venv on first use)
	bash scripts/demo.sh

check:  ## while you work (~3 min): lint, types, and the tests that need no server, process or browser
	bash scripts/check.sh

test:  ## lint, type-check, run the tests and build the docs
	bash scripts/test.sh

lint:
	bash scripts/lint.sh

format:
	bash scripts/format.sh

docs:
	bash scripts/docs.sh

bench:  ## per-turn cost up to 10,000 turns and with 50 agents (~15 min); see bench/README.md
	bash -c 'source scripts/env.sh && "$$PYTHON" bench/bench_persistence.py --long --agents 50 --profile'

soak:  ## 4 processes x 16 agents SIGKILLed at random, 2 min per durability setting (~6 min); see bench/README.md
	bash -c 'source scripts/env.sh && "$$PYTHON" bench/soak.py $(SOAK_ARGS)'

screenshots:  ## the page's browser tests, saving their screenshots as the docs' copies
	bash -c 'source scripts/env.sh && EFFECTFUL_DURABLE_SCREENSHOTS=docs/source/_static/ui "$$PYTHON" -m pytest -q tests/ui/test_browser.py tests/ui/test_deciding.py tests/ui/test_check_page.py tests/ui/test_forgetting.py'

faults:  ## every I/O call of every operation failed in turn, and power cut at every sync (~20 min)
	bash scripts/faults.sh

crash:  ## the SIGKILL and network-cut tests, and the others EFFECTFUL_DURABLE_CRASH=full widens, with every case they allow, on both backends (~24 min)
	bash -c 'source scripts/env.sh && EFFECTFUL_DURABLE_CRASH=full "$$PYTHON" -m pytest -q -s -p no:cacheprovider tests/processes/test_*crash.py tests/processes/test_hold_freezes.py tests/processes/test_partitions.py tests/runner/test_heartbeats.py tests/runner/test_refused_heartbeats.py tests/runner/test_idle_runner.py'

pg-faults:  ## PostgreSQL restarted, frozen and cut at random, loops in full (~5 min)
	bash scripts/pg_faults.sh
