"""The conformance suites every backend runs: subclass one, say how to build your backend.

Suites: ``TrainBackendSuite`` (lrft.testing.conformance.train), ``RolloutEngineSuite``
(lrft.testing.conformance.rollout), ``WeightSyncSuite`` (lrft.testing.conformance.sync) and
``RolloutLayoutSuite`` (lrft.testing.conformance.layout). They import pytest: import them from
test modules only.
"""
