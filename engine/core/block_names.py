"""What a disk-tier block file's name says (engine/tiers/block_file.py writes and reads the files): the producer's
fingerprint, the tenant's salt tag and the chain hash. Torch-free, so that what sits above the engine (the served
models' registry, app/http/model_registry.py, purging a tenant from a model that is not loaded) reads names exactly
as the tier does."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.hash_chain import SALT_TAG_BYTES

SUFFIX = ".kvb"
FINGERPRINT_BYTES = 16


@dataclass(frozen=True)
class BlockName:
    """What a block file's name says: the producer's fingerprint, the tenant's salt tag and the chain hash."""

    fingerprint: bytes
    salt_tag: bytes
    block_hash: bytes

    @property
    def filename(self) -> str:
        return f"{self.fingerprint.hex()}-{self.salt_tag.hex()}-{self.block_hash.hex()}{SUFFIX}"

    @staticmethod
    def parse(filename: str) -> BlockName | None:
        """The name's parts, or None for a file that is not a block (a leftover temporary, a stranger)."""
        if not filename.endswith(SUFFIX):
            return None
        parts = filename[: -len(SUFFIX)].split("-")
        if len(parts) != 3:
            return None
        try:
            fingerprint, salt_tag, block_hash = (bytes.fromhex(p) for p in parts)
        except ValueError:
            return None
        if len(fingerprint) != FINGERPRINT_BYTES or len(salt_tag) != SALT_TAG_BYTES or len(block_hash) != 16:
            return None
        return BlockName(fingerprint, salt_tag, block_hash)
