"""Plain data that the engine, the control plane and the messages share, without torch.

Roles, the engine's configuration, sampling parameters and what an engine reports back,
and the checks any front end makes on a request. Nothing here imports torch (a test checks
that the messages, the control plane, the router, the scaler and the simulator do not
either), so the control plane runs where torch is not installed.
"""
