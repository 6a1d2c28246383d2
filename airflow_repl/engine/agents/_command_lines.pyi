def row_line(
    message: bytes | memoryview,
    positions: bytes,
    keys: bytes,
    pairs: bool,
    prefix: bytes,
    command_id: int,
    article: bytes,
    /,
) -> bytes | None: ...
def lsn_text(value: int, /) -> str: ...
def transaction_line(
    publication: bytes,
    xact_seqno: str,
    xid: int,
    commit_us: int,
    end_lsn: int,
    command_count: int,
    article_rows: dict[str, int],
    origin: str | None,
    schema_change: bool,
    /,
) -> bytes | None: ...
