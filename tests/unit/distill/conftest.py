"""The remote reward tests' scripted HTTP server on 127.0.0.1, for the teacher's client."""

from tests.unit.rewards.test_remote import serve as serve
