"""Child process of the loader security tests: like tests/loader/_child.py, plus attack hooks.

stdin: {"setup": python code, "cases": [{"name", "call", "kwargs", "before": python code, "run_attention"}]}.
`setup` runs once (e.g. wrap `winattn.verify.verify_variant` to rewrite a file right after verification), `before`
before its case (e.g. switch huggingface_hub to offline mode). Both run in one namespace. After each case the result
also carries `pwned`: the content of $WINATTN_PWNED, which the attackers' code appends to when it runs.
"""

import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))

from _child import run_case  # noqa: E402


def _pwned() -> str:
    try:
        return Path(os.environ["WINATTN_PWNED"]).read_text()
    except (KeyError, OSError):
        return ""


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    job = json.loads(sys.stdin.read())
    namespace: dict = {}
    exec(job.get("setup") or "", namespace)
    results = []
    for case in job["cases"]:
        exec(case.get("before") or "", namespace)
        result = run_case(case)
        result["pwned"] = _pwned()
        results.append(result)
    print(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
