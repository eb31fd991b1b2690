"""The Kubernetes operator: WebhookEndpoint resources into Postgres, their
queue health back onto the resources. ``hooklane operator`` runs it."""
