"""A rotation of keys that the reseal crash test kills (processes/test_reseal_crash.py).

Usage: ``python tests/programs/reseal_child.py DB KEY_FILE KEY_STORE``: says ``resealing`` once
its Store is open, seals every row again with new keys, a few rows a transaction,
then says ``done``.
"""

import os
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

from effectful_durable import Keys, Store


def main() -> None:
    db, key_file, key_store = sys.argv[1:4]
    with Store(db, keys=Keys.from_file(key_file, store=key_store)) as store:
        print("resealing", flush=True)
        report = store.reseal(rotate=True, batch=4)
        print("done", report.keys, flush=True)


if __name__ == "__main__":
    main()
