"""Vision-language rows: dataset rows with images, in the form TRL's vision trainers take.

Two input layouts are read, for SFT (`messages` rows) and for the prompt of DPO (`preference` rows):

* content lists (OpenAI / Hugging Face): a message's ``content`` is a list of typed entries, an image
  being ``{"type": "image", "image": "img/cat.png"}`` (or ``"path"`` / ``"url"`` keys, or
  ``{"type": "image_url", "image_url": {"url": ...}}``). A bare ``{"type": "image"}`` takes the next
  image of the row's image column (the form TRL itself writes, so its output reads back unchanged).
* LLaVA / ShareGPT-4V / Axolotl: an image column (``images``: a list of paths, or ``image``: one path)
  and ``<image>`` placeholders in the message texts (``messages`` with role/content, or ShareGPT
  ``conversations`` with from/value). Each placeholder becomes an image entry where it stands. A row
  whose image column holds images but whose texts hold no placeholder gets them at the start of its
  first user turn (LLaVA's convention).

The output is ``{"messages": [{"role", "content": [{"type": "text", "text"} | {"type": "image"}]}],
"images": [...]}`` (SFT) or ``{"prompt", "chosen", "rejected", "images"}`` (DPO, the images in the
prompt), ``images`` listing absolute local paths in the order of the image entries: http(s) URLs are fetched
once into the image folder (`fetched_image_path`; kept as URLs only where a command keeps no such
folder). Every image is checked (found or fetched, decodable) here, before any training starts; each
problem names the dataset file, the 1-based row and the image path or URL.

Video entries are refused: a list of frames is not a set of independent images to the models.
PIL is imported inside the functions, so reading a recipe never loads it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipeforge.components.formats import _ROLE_ALIASES  # the role names every chat format accepts
from recipeforge.errors import Location, RecipeError, excerpt

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

PLACEHOLDER = "<image>"
# LLaVA writes "<image>\n" before the question: the newline belongs to the placeholder, not the text.
_SPLIT = re.compile(re.escape(PLACEHOLDER) + r"\n?")
IMAGE_COLUMNS = ("images", "image")       # the default image column: the first of these a row has
_IMAGE_TYPES = ("image", "image_url")
_VIDEO_TYPES = ("video", "video_url")
_LOCATION_HINT = ("relative image paths start at the dataset file's folder, or at "
                  "data.datasets[].image_root when it is set")


def vision_rows(rows: list[dict], *, source: Path | str, base_dir: Path, kind: str = "messages",
                location: Location | None = None, image_column: str | None = None,
                embedded_dir: Path | None = None) -> list[dict]:
    """Raw dataset rows as TRL vision rows, every local image checked.

    `source` names the dataset in messages; `base_dir` is where relative image paths start (the
    dataset file's folder, or `image_root`; see `image_base_dir`). `kind` is ``"messages"`` (SFT:
    ``{"messages", "images"}``) or ``"preference"`` (DPO: ``{"prompt", "chosen", "rejected",
    "images"}``). `image_column` names the column of layout (b); default: ``images`` when a row has
    it, else ``image``. A row's number is its ``_row`` value when the loader added one, else its
    1-based position. Problems raise `RecipeError` (at `location`, the dataset's entry in the recipe).

    Images held in the data itself (a `datasets` Image column, as hub datasets store them: ``{"bytes",
    "path"}`` or decoded PIL images) are written once to `embedded_dir`, named by their content's hash,
    and referred to by that path like any other image (`embedded_image_path`)."""
    if kind not in ("messages", "preference"):
        raise ValueError(f"kind must be 'messages' or 'preference', got {kind!r}")
    convert = _sft_row if kind == "messages" else _preference_row
    out = []
    for i, raw in enumerate(rows, start=1):
        row = _Row(source, raw.get("_row", i) if isinstance(raw, dict) else i, Path(base_dir), location,
                   embedded_dir)
        if not isinstance(raw, dict):
            raise row.error(f"is a {type(raw).__name__}, not a mapping of columns")
        result = convert(raw, row, _column_images(raw, row, image_column))
        for path in result["images"]:
            _check_image(path, row)
        out.append(result)
    return out


def image_base_dir(dataset_path: Path | str, image_root: str | None = None, *,
                   recipe_dir: Path | None = None) -> Path:
    """The folder relative image paths start at: `image_root` (relative to `recipe_dir`, as every path
    in a recipe is) when set, else the dataset file's folder (the dataset itself when it is a folder)."""
    if image_root:
        root = Path(image_root).expanduser()
        return (root if root.is_absolute() or recipe_dir is None else Path(recipe_dir) / root).resolve()
    path = Path(dataset_path).expanduser().resolve()
    return path if path.is_dir() else path.parent


def count_images(row: dict) -> int:
    """How many images a row from `vision_rows` holds (its ``images`` list)."""
    return len(row.get("images") or ())


def load_image(path_or_url: str):
    """A local image as a decoded PIL RGB image (EXIF orientation applied).

    Network images are not fetched here: an http(s) URL is a `RecipeError` asking for a local copy."""
    from PIL import Image, ImageOps

    if _is_url(path_or_url):
        raise RecipeError(f"image {excerpt(path_or_url)} is a URL; network images must be downloaded first",
                          hint="download the images and write their local paths in the dataset")
    path = _file_url_path(path_or_url)
    # The path unquoted: messages shorten long quoted values in their middle.
    try:
        with Image.open(path) as img:
            img = ImageOps.exif_transpose(img)
            # Palette images with a transparent colour convert through RGBA, as PIL asks.
            if img.mode == "P" and "transparency" in img.info:
                img = img.convert("RGBA")
            return img.convert("RGB")
    except FileNotFoundError:
        raise RecipeError(f"image {path} not found") from None
    except Image.UnidentifiedImageError:
        raise RecipeError(f"image {path} cannot be read (not a format PIL knows)") from None
    except Exception as exc:  # OSError (truncated), SyntaxError (bad PNG chunks), decompression bombs
        problem = _first_line(exc).replace(repr(path), "the file").replace(path, "the file")
        raise RecipeError(f"image {path} cannot be read ({problem})") from None


def _check_image(path: str, row: _Row) -> None:
    """Refuse a local image that is missing or does not decode (URLs are the model side's to fetch)."""
    if _is_url(path):
        return
    try:
        st = os.stat(path)
    except OSError:
        raise row.error(f"image {row.named(path)} not found", hint=_LOCATION_HINT) from None
    problem = _decode_problem(path, st.st_mtime_ns, st.st_size)
    if problem:
        raise row.error(f"image {row.named(path)} cannot be read as an image ({problem})",
                        hint="replace or remove the file; it may be truncated or not an image")


# Each image is decoded once per process, whatever number of rows name it: (path, mtime, size) -> problem.
_CHECKED: dict[tuple[str, int, int], str | None] = {}


def _decode_problem(path: str, mtime_ns: int, size: int) -> str | None:
    key = (path, mtime_ns, size)
    if key not in _CHECKED:
        _CHECKED[key] = _decode(path)
    return _CHECKED[key]


def _decode(path: str) -> str | None:
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.verify()  # the container and its checksums, without decoding pixels
            fmt = img.format
        if fmt != "PNG":
            # A PNG's verify() has checked the CRC of every chunk, pixel data included, and found its end:
            # decoding adds little but time (0.2 s for a 3000x3000 image). Other formats are decoded, small
            # (JPEGs at reduced scale), so a truncated body fails here rather than in a training step.
            with Image.open(path) as img:
                img.draft("RGB", (64, 64))
                img.load()
    except Image.UnidentifiedImageError:
        return "not a format PIL knows"
    except Exception as exc:  # OSError (truncated), SyntaxError (bad PNG chunks), decompression bombs
        # The message is said next to the path already; PIL's often repeats it.
        return _first_line(exc).replace(repr(path), "the file").replace(path, "the file")
    return None


class _Row:
    """Where a row is, for its error messages."""

    def __init__(self, source: Path | str, number: int, base_dir: Path, location: Location | None,
                 embedded_dir: Path | None = None):
        self.source, self.number, self.base_dir, self.location = str(source), number, base_dir, location
        self.embedded_dir = embedded_dir
        self.written: dict[str, str] = {}  # resolved path -> the reference as the row wrote it

    def named(self, path: str) -> str:
        """A local image for a message: as the row wrote it, and the file looked at. The full path is left
        unquoted: messages shorten long quoted values in their middle, where a path's folders are."""
        ref = self.written.get(path, path)
        return path if ref == path else f"{excerpt(ref)} ({path})"

    def error(self, message: str, *, hint: str | None = None) -> RecipeError:
        return RecipeError(f"{self.source}: row {self.number}: {message}", location=self.location, hint=hint)


def _is_url(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


def _file_url_path(ref: str) -> str:
    if ref.startswith("file://"):
        from urllib.parse import urlparse
        from urllib.request import url2pathname

        return url2pathname(urlparse(ref).path)
    return ref


def _resolve(ref: object, row: _Row, where: str) -> str:
    """An image reference as an absolute local path (relative ones from `row.base_dir`) or an http(s) URL."""
    if isinstance(ref, dict) and ref.get("bytes") or type(ref).__module__.startswith("PIL."):
        return embedded_image_path(ref, row, where)
    if isinstance(ref, dict):  # a datasets Image feature read without decoding: {"path", "bytes"}
        ref = ref.get("path") or ref.get("url")
    if not isinstance(ref, str) or not ref.strip():
        raise row.error(f"{where} must be a file path or an http(s) URL (got {excerpt(ref)})",
                        hint="write each image as a path relative to the dataset file, e.g. \"images/cat.png\"")
    ref = ref.strip()
    if _is_url(ref):
        # Fetched now, once, into the image folder: a URL that fails mid-training would end the run with a
        # library's error; here it is this row's error, before any training.
        return fetched_image_path(ref, row, where) if row.embedded_dir is not None else ref
    if ref.startswith("data:") or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]+://", ref) and not ref.startswith("file://"):
        raise row.error(f"{where} {excerpt(ref)} is neither a file path nor an http(s) URL",
                        hint="write the image to a file and give its path")
    path = Path(_file_url_path(ref)).expanduser()
    resolved = str(path if path.is_absolute() else (row.base_dir / path).resolve())
    row.written.setdefault(resolved, ref)
    return resolved


def embedded_image_path(image: dict[str, Any] | PILImage, row: _Row, where: str) -> str:
    """The file an image held in the data is kept in: `row.embedded_dir`/<sha256 of its bytes>.<format>,
    written once (atomically) and shared by every row and run holding the same image. `image` is a
    `datasets` Image value (``{"bytes", "path"}``) or a PIL image (encoded as PNG)."""
    import hashlib
    import io
    import os
    import tempfile

    if row.embedded_dir is None:
        raise row.error(f"{where} is held in the data itself, and this command keeps no image folder",
                        hint="train or preprocess the recipe (they keep such images under data.cache_dir)")
    if isinstance(image, dict):
        data = bytes(image["bytes"])
    else:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data = buffer.getvalue()
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            suffix = (img.format or "png").lower()
    except Exception as exc:  # PIL raises many kinds for bytes that are no image
        raise row.error(f"{where} holds bytes that are not an image ({_first_line(exc)})",
                        hint="fix or drop this row") from None
    folder = Path(row.embedded_dir)
    path = folder / f"{hashlib.sha256(data).hexdigest()[:32]}.{suffix}"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # concurrent writers of the same image write the same bytes
    row.written.setdefault(str(path), f"{where} (held in the data)")
    return str(path)


MAX_IMAGE_BYTES = 64 * 2**20   # one image; a larger download is a mistake (a video, an archive)
FETCH_TIMEOUT_S = 30


def fetched_image_path(url: str, row: _Row, where: str) -> str:
    """The local copy of the http(s) image `url`: `row.embedded_dir`/url-<sha256 of the URL>.<suffix>,
    downloaded once (at most `MAX_IMAGE_BYTES`, redirects to http(s) only, `FETCH_TIMEOUT_S` per read)
    and kept for later runs. A failure is this row's `RecipeError`, naming the URL and why."""
    import hashlib
    import tempfile
    import urllib.error
    import urllib.request

    folder = Path(row.embedded_dir)  # type: ignore[arg-type]  (the caller checked it is set)
    key = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    done = sorted(folder.glob(f"url-{key}.*")) if folder.is_dir() else []
    if done:
        row.written.setdefault(str(done[0]), url)
        return str(done[0])

    class _HttpOnly(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib's hook)
            if not _is_url(newurl):
                raise urllib.error.URLError(f"redirected to {newurl[:80]!r}, which is not http(s)")
            return super().redirect_request(req, fp, code, msg, headers, newurl)

    opener = urllib.request.build_opener(_HttpOnly())
    request = urllib.request.Request(url, headers={"User-Agent": "recipeforge"})
    try:
        with opener.open(request, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read(MAX_IMAGE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        raise row.error(f"{where} {excerpt(url)} cannot be fetched: HTTP {exc.code} {exc.reason}",
                        hint="check the URL, or download the image and give its local path") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # DNS, refused, timeout, a malformed URL
        reason = getattr(exc, "reason", None) or exc
        raise row.error(f"{where} {excerpt(url)} cannot be fetched: {_first_line(reason) if isinstance(reason, BaseException) else reason}",
                        hint="check the URL and the network, or download the image and give its local path") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise row.error(f"{where} {excerpt(url)} is larger than {MAX_IMAGE_BYTES // 2**20} MiB: not one image",
                        hint="give the URL of the image itself, or a local copy")
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            suffix = (img.format or "png").lower()
    except Exception as exc:  # PIL raises many kinds for bytes that are no image (an HTML error page)
        raise row.error(f"{where} {excerpt(url)} is not an image ({_first_line(exc)}; {len(data)} bytes)",
                        hint="give the URL of the image file itself, or a local copy") from None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"url-{key}.{suffix}"
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    row.written.setdefault(str(path), url)
    return str(path)


def _column_images(raw: dict, row: _Row, column: str | None) -> list[str]:
    """The images of layout (b)'s image column, resolved, in order; [] when the row has none."""
    # The first default column with a value: rows read through `datasets` have every column, None where empty.
    name = column or next((c for c in IMAGE_COLUMNS if raw.get(c) is not None), None)
    value = raw.get(name) if name else None
    if value is None:
        return []
    refs = value if isinstance(value, (list, tuple)) else [value]
    return [_resolve(ref, row, f"image {j} of column '{name}'") for j, ref in enumerate(refs, start=1)]


class _Images:
    """The images of one row as its messages are read: column images handed out to placeholders, in
    order, and every image entry's path in the order the entries appear."""

    def __init__(self, column: list[str], row: _Row):
        self.column, self.row = column, row
        self.placeholders = 0      # placeholders and bare image entries: each takes a column image
        self.inline = 0            # image entries that name their own file
        self.order: list[str | int] = []  # a path, or the index of a column image

    def placeholder(self) -> dict:
        self.order.append(self.placeholders)
        self.placeholders += 1
        return {"type": "image"}

    def named(self, ref: object, where: str) -> dict:
        self.order.append(_resolve(ref, self.row, where))
        self.inline += 1
        return {"type": "image"}

    def paths(self, messages: list[dict]) -> list[str]:
        """Every image's path; checks the placeholders match the column's images. Column images with no
        placeholder at all go to the start of the first user turn of `messages`."""
        if self.column and not self.placeholders:
            if self.inline:
                raise self.row.error(f"has images both in its messages and in its image column "
                                     f"({len(self.column)}), and no {PLACEHOLDER} placeholder to place the latter",
                                     hint=f"put a {PLACEHOLDER} placeholder (or a bare {{\"type\": \"image\"}} "
                                          f"entry) where each column image goes")
            first_user = next((m for m in messages if m["role"] == "user"), None)
            if first_user is None:
                raise self.row.error("has images but no user turn to put them in")
            first_user["content"][:0] = [{"type": "image"} for _ in self.column]
            return list(self.column)
        if self.placeholders != len(self.column):
            raise self.row.error(f"has {_n(self.placeholders, PLACEHOLDER + ' placeholder')} and "
                                 f"{_n(len(self.column), 'image')}",
                                 hint=f"each image of the image column needs one {PLACEHOLDER} placeholder "
                                      f"where it goes, in order")
        return [self.column[p] if isinstance(p, int) else p for p in self.order]


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _content(content: object, role: str, images: _Images, where: str) -> list[dict]:
    """A message's content as typed entries: text pieces and image entries, in order."""
    before = len(images.order)
    entries: list[dict] = []
    if isinstance(content, str):
        entries = _split_text(content, images)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            entries.extend(_part(part, images, f"{where} content[{j}]"))
    else:
        raise images.row.error(f"{where} content must be text or a list of typed entries (got "
                               f"{type(content).__name__})")
    if role == "assistant" and len(images.order) > before:
        raise images.row.error(f"{where} (an assistant turn) holds an image; models read images, they do not "
                               f"write them", hint="move the image into the user turn before it")
    return entries


def _split_text(text: str, images: _Images) -> list[dict]:
    entries: list[dict] = []
    pieces = _SPLIT.split(text)
    for k, piece in enumerate(pieces):
        if k:
            entries.append(images.placeholder())
        if piece:
            entries.append({"type": "text", "text": piece})
    return entries


def _part(part: object, images: _Images, where: str) -> list[dict]:
    if isinstance(part, str):
        return _split_text(part, images)
    if not isinstance(part, dict):
        raise images.row.error(f"{where} must be a mapping with a 'type' (got {type(part).__name__})")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise images.row.error(f"{where} is a text entry without a text string")
        return _split_text(text, images)
    if kind in _IMAGE_TYPES:
        # The first key that holds a value: rows read through `datasets` carry every key of every entry,
        # the unused ones None.
        ref = next((part[k] for k in ("image_url", "image", "path", "url") if part.get(k) is not None), None)
        if isinstance(ref, dict) and "bytes" not in ref:  # {"image_url": {"url": ...}}
            ref = ref.get("url") or ref.get("path")
        if ref is None:  # a bare entry: the next image of the image column
            return [images.placeholder()]
        return [images.named(ref, f"{where} image")]
    if kind in _VIDEO_TYPES:
        raise images.row.error(f"{where} is a video; video is not supported yet",
                               hint="give the frames you want as separate image entries, or leave the row out")
    raise images.row.error(f"{where} has type {excerpt(kind)}; expected text or image")


def _messages(messages: object, images: _Images, column: str) -> list[dict]:
    """Messages (role/content or ShareGPT from/value) with their content as typed entries."""
    if not isinstance(messages, list) or not messages:
        raise images.row.error(f"column '{column}' must be a non-empty list of messages (got "
                               f"{type(messages).__name__})")
    out = []
    for j, m in enumerate(messages):
        where = f"{column}[{j}]"
        if not isinstance(m, dict):
            raise images.row.error(f"{where} must be a mapping with role and content")
        role = m.get("role", m.get("from"))
        norm = _ROLE_ALIASES.get(str(role).lower()) if role is not None else None
        if norm is None:
            raise images.row.error(f"{where} role {excerpt(role)} is not one of user, assistant, system, tool "
                                   f"(or ShareGPT human, gpt)")
        msg: dict = {"role": norm, "content": _content(m.get("content", m.get("value")), norm, images, where)}
        if isinstance(m.get("train"), bool):  # the SFT formats' per-reply training switch
            msg["train"] = m["train"]
        out.append(msg)
    return out


def _sft_row(raw: dict, row: _Row, column_images: list[str]) -> dict:
    column = "messages" if "messages" in raw else "conversations" if "conversations" in raw else None
    if column is None:
        raise row.error("has no 'messages' (or ShareGPT 'conversations') column",
                        hint="map your column with data.datasets[].columns, e.g. {messages: conversation}")
    images = _Images(column_images, row)
    messages = _messages(raw[column], images, column)
    return {"messages": messages, "images": images.paths(messages)}


def _preference_row(raw: dict, row: _Row, column_images: list[str]) -> dict:
    images = _Images(column_images, row)
    prompt = raw.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if prompt is None:
        raise row.error("has no 'prompt' column; vision preference rows hold their images in the prompt")
    prompt_msgs = _messages(prompt, images, "prompt")
    paths = images.paths(prompt_msgs)
    out: dict = {"prompt": prompt_msgs}
    for name in ("chosen", "rejected"):
        value = raw.get(name)
        if isinstance(value, str):
            value = [{"role": "assistant", "content": value}]
        # Completions must not hold images: TRL puts a row's images in its prompt only.
        completion = _Images([], row)
        out[name] = _messages(value, completion, name)
        if completion.order:
            raise row.error(f"column '{name}' holds an image; preference rows hold their images in the prompt")
    out["images"] = paths
    return out


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
