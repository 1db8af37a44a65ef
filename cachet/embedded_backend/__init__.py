"""Django's ``postgresql`` backend on the embedded Postgres, which the first connection starts."""
