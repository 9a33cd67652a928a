"""Request and response bodies of ``POST /v1/embeddings`` and ``GET /v1/models`` (OpenAI-shaped, with vecbridge's
extensions), apart from :mod:`.schemas` (which imports them back) for its size."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from .body_models import StrictRequestModel as _Strict
from .name_types import MapPath, Name
from .number_types import Count, Flag

__all__ = ["EmbeddingItem", "EmbeddingsRequest", "EmbeddingsResponse", "ModelList"]


class EmbeddingsRequest(_Strict):
    input: str | list[str] = Field(..., description="Text or list of texts.")
    model: str = Field(..., description="Installed encoder name (GET /v1/models).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Count | None = Field(None, description="Accepted only when equal to the output dimension "
                                                     "(these models cannot truncate).")
    user: str | None = None
    target_space: Name | None = Field(None, description="Translate the embeddings into this space through the "
                                                       "registry's maps (vecbridge extension).")
    input_type: Literal["passage", "query"] = Field("passage", description="Encoder form (vecbridge extension).")
    map: MapPath | None = Field(
        None, description="With `target_space`: use this map (`name`, `name@alias`, `name:N`) instead of the "
                          "registry's path, or a path of them in order (a list: from the model's space to "
                          "`target_space`), e.g. the `maps` of an earlier answer as `name:version`: every batch of "
                          "a large text set then goes through the same versions (vecbridge extension).")
    truncate: Flag = Field(
        True, description="A text longer than the model reads (`max_tokens` of GET /v1/models: MiniLM 256, mpnet "
                          "384 word pieces; e5 reads any length) is embedded from its start, the rest unread, and "
                          "counted in `usage.truncated` (true, the default); false: such a text is refused, a 422 "
                          "naming the first (`input[i]`, its tokens, the limit), nothing embedded (as "
                          "text-embeddings-inference's `truncate`; vecbridge extension).")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[dict[str, Any]]


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(..., description="Numbers, or base64 float32 with encoding_format=base64.")


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: dict[str, int] = Field(..., description="`prompt_tokens` and `total_tokens` (the tokens the model read, "
                                                   "word pieces and specials included: at most `max_tokens` a "
                                                   "text), `truncated`: the texts embedded from their first "
                                                   "`max_tokens` tokens only (request `truncate`).")
    target_space: str | None = None
    maps: list[dict[str, Any]] | None = None
