"""Public name of the server test-suite API: `from eagle_eval.testing import EagleOracle, ...`.

The code lives in `eagle_eval.servers.testing`; this module only keeps the public import path stable.
"""

from eagle_eval.servers.testing import *  # noqa: F401,F403
from eagle_eval.servers.testing import __all__  # noqa: F401
