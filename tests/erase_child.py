"""An erasure that the erase crash test kills (tests/test_erase_crash.py).

Usage: ``python tests/erase_child.py DB SUBJECT``: says ``erasing`` once its Store is
open, erases SUBJECT, then says ``done`` and the receipt's id.
"""

import os
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

from effectful_durable import Store


def main() -> None:
    db, subject = sys.argv[1], sys.argv[2]
    with Store(db) as store:
        print("erasing", flush=True)
        receipt = store.erase(subject=subject)
        print("done", receipt.erasure_id, flush=True)


if __name__ == "__main__":
    main()
