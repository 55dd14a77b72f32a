from tailflow.engines.store.local import LocalStore, StoreError, open_store

__all__ = ["LocalStore", "StoreError", "open_store"]
