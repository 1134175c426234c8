"""A support desk that keeps what customers tell it encrypted, and forgets one on request.

    python examples/privacy.py            # offline, scripted model
    python examples/privacy.py --fresh    # start over

Each customer talks to an agent of their own, whose *subject* names them. With
``keys=`` every kind of content is sealed (AES-GCM, each value bound to its row)
under data keys kept outside the database, in ``support.db.keys``. The program
makes a backup, then erases one customer as a GDPR request would: the live
database no longer holds a byte of theirs, and the backup made before reads
"erased" for them, while the other customer reads back from it exactly.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import argparse
import dataclasses
from pathlib import Path

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import (
    ContentErasedError,
    Keys,
    LocalMasterKey,
    PersistenceHandler,
    PersistentAgent,
    StateTools,
    Store,
)
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

OUT = Path(__file__).parent / "out"

#: What each customer tells the desk.
CUSTOMERS = {
    "ann": ["My card ends in 4711 and my parcel never came.", "Please call me on 0151-4711."],
    "bob": ["I'd like to change my address to 12 Elm Street."],
}


@dataclasses.dataclass
class SupportDesk(PersistentAgent, StateTools):
    """You help one customer. Keep what they tell you about themselves in your state
    (keys like customer.phone). Answer in one sentence."""

    @Template.define
    def chat(self, message: str) -> str:
        """The customer says: {message}"""
        raise NotHandled


def scripted_model(call: FakeCall) -> object:
    """Keep a phone number or an address the customer gives; then acknowledge."""
    if call.messages[-1]["role"] == "tool":
        return "Thank you, I have noted that."
    text = call.last_user_text.removeprefix("The customer says: ")
    for said, key in (("call me on ", "customer.phone"), ("address to ", "customer.address")):
        if said in text:
            value = text.split(said)[1].rstrip(".")
            return ToolCall("put_state", {"key": key, "value": f'"{value}"'})
    return "I am sorry to hear that; I will look into it."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=OUT, help="where the files go")
    parser.add_argument("--fresh", action="store_true", help="delete the files first")
    args = parser.parse_args()
    db, key_file, backup = args.dir / "support.db", args.dir / "master.key", args.dir / "backup.db"
    if args.fresh:
        for path in args.dir.glob("support.db*"):
            path.unlink()
    backup.unlink(missing_ok=True)  # each run makes its own
    args.dir.mkdir(parents=True, exist_ok=True)
    if not key_file.exists():  # in production: a secret mount, or Keys(your_kms, store=...)
        key_file.write_text(LocalMasterKey.generate())
    keys = Keys.from_file(key_file)

    # -- Each customer's agent, its subject named before the first turn --------------------
    with Store(db, keys=keys) as store:
        for customer in CUSTOMERS:
            store.set_subject(customer, f"customer:{customer}")
    persistence = PersistenceHandler(db, keys=keys)
    with (
        handler(LiteLLMProvider(model="offline")),
        handler(FakeLLM(respond=scripted_model)),
        handler(persistence),
    ):
        for customer, messages in CUSTOMERS.items():
            desk = SupportDesk(agent_id=customer)
            for message in messages:
                print(f"{customer}> {message}")
                print(f"desk> {desk.chat(message)}")
    persistence.close()

    # -- Nothing of theirs is readable in the file itself ------------------------------------
    raw = b"".join(path.read_bytes() for path in args.dir.glob("support.db*"))
    print(f"\n'4711' in the database's files: {b'4711' in raw}")

    with Store(db, keys=keys) as store:
        store.backup(backup)
        print(f"backup made: {backup.name}")

        # -- A request to forget ann ---------------------------------------------------------
        receipt = store.erase(subject="customer:ann")
        print(f"erased: agents {list(receipt.agents)}, {dict(receipt.counts)}")
        print(f"receipt digest (for an audit): {receipt.digest[:16]}...")
        print(f"who holds customer:ann now: {store.holders('customer:ann')}")

    # -- The backup from before: bob reads back, ann is gone with her keys ---------------------
    with Store(backup, keys=Keys.from_file(key_file, store=f"{db}.keys")) as old:
        print(f"bob in the backup: {old.memory('bob')}")
        try:
            old.history("ann")
        except ContentErasedError as erased:
            print(f"ann in the backup: {erased}")


if __name__ == "__main__":
    main()
