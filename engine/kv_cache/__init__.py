from loraplex.engine.kv_cache.block_pool import BlockPool, KVCacheBlock
from loraplex.engine.kv_cache.kv_cache_manager import KVCacheManager

__all__ = ["BlockPool", "KVCacheBlock", "KVCacheManager"]
