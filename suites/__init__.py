"""LightEval task configs and bundled data. Imports lighteval only, never adapters or db.

Importing this package is cheap: `suites.registry` imports lighteval only when a suite is loaded,
so `loopeval suites` and the harness's error handling do not pay for it.
"""


class SuiteError(ValueError):
    """A suite problem the user can fix (unknown suite or task, missing data file).

    The harness turns it into one line on stderr and exit code 2.
    """
