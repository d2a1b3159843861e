"""0.1.0's place of ``payments.kernel.logformat``, kept for one release so a host's ``LOGGING`` that
names it keeps working; ``manage.py check`` warns (payments.W003). Name
``payments.kernel.logformat`` instead: this module goes in the next release."""

from payments.kernel.logformat import *  # noqa: F403
