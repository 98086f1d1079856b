"""benchmarks/trainer_step.py with Unsloth imported first, for its ``unsloth`` side (issue 29's Unsloth
peer): Unsloth patches transformers, peft and TRL's ``GRPOTrainer`` when it is imported before them.
Takes trainer_step.py's arguments; on the lent GPU machines with /tmp/site-unsloth first on the path
(``session.sh unsloth``: Unsloth's wheels, with the trl 1.15.0 and datasets 4.3.0 it pins).

    PYTHONPATH=/tmp/site-unsloth:$PYTHONPATH python3 scripts/gpu/unsloth_step.py --mode fixed --lora --sides unsloth
"""

import os
import runpy
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the lent machines
import unsloth  # noqa: E402, F401  (first: it patches what trainer_step.py imports)

script = Path(__file__).resolve().parents[2] / "benchmarks" / "trainer_step.py"
sys.argv[0] = str(script)
sys.path.insert(0, str(script.parent))
runpy.run_path(str(script), run_name="__main__")
