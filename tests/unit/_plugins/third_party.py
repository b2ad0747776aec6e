"""A stand-in third-party backend module, registered through an entry point in the tests."""


class ThirdPartyEngine:
    name = "third-party"
