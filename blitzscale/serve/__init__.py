"""The serving cluster: router (request flow, KV migration), scaler, and the serve command."""
