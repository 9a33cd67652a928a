"""One router per resource, mounted by :func:`service.api.create_app`."""
