"""The request bodies of every route (pydantic models), shared by api/ and serving/."""
