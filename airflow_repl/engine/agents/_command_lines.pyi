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
