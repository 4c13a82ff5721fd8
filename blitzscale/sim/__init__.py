"""The cluster simulator: the real control plane (router, scaler, planner, policies) on a
virtual clock against simulated instances, links and disks (`blitzscale simulate`)."""
