"""Django's PostgreSQL backend with psycopg's pool, failing fast while the database is down."""
