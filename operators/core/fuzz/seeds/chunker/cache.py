import os

# Paths of the cache.
def cache_dir(name):
    """The cache directory of `name`."""
    return os.path.join(HOME, name)


class Cache:
    @property
    def size(self):
        return sum(os.path.getsize(p) for p in os.listdir(self.root))
