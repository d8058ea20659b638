"""The database layer: toolhub's Django database backends and migration operations.

- `postgresql/`: Django's PostgreSQL backend (`ENGINE` `toolhub.db.postgresql`) with
  prepared statements per connection (`statement_cursor`) and a connection pool that
  fails fast while the database is down (`pool`).
- `sqlite3/`: Django's SQLite backend (`ENGINE` `toolhub.db.sqlite3`), with writers queued
  on a lock per process and an `flock` across processes.
- `index_ops`: `DropFieldIndex`, a migration operation that drops a foreign key's own
  index without SQLite rebuilding the table.

`toolhub.settings` picks the backend from `DATABASE_URL`. Django loads a backend before
the apps are ready, so nothing here imports `apps`; the apps import only
`statement_cursor`, `pool` and (in migrations) `index_ops`.
"""
