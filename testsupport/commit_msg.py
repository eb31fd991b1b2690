"""What tests/processes/test_commit_msg.py and tests/unit/test_commit_msg.py
share."""

from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import hooklane

# A script without a .py suffix, so loaded by path rather than imported.
loader = SourceFileLoader("commit_msg", str(Path(hooklane.__file__).parents[1] / "hack" / "commit-msg"))


commit_msg = module_from_spec(spec_from_loader("commit_msg", loader))


BODY = "Why it changed, wrapped at 72.\n"
