"""The parameter plane's data path: moving weight segments between ranks, host and disk."""
