"""Memory in the optimizer: a strategy's predicted peak (:mod:`.peak`), the search that makes
a job fit a budget (:mod:`.fit`), and micro-batch op times measured on a second trace
(:mod:`.micro_batch`)."""
