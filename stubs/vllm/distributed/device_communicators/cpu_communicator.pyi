from typing import Any

class _CPUSHMDistributed:
    @staticmethod
    def make_group_name(communicator: Any) -> str: ...
