"""The record: the contract between the wire (proxy) and the disk (segments) and the analyzer."""

from toolproxy.record.model import RECORD_VERSION, Record, body_bytes, encode_body, new_id

__all__ = ["RECORD_VERSION", "Record", "body_bytes", "encode_body", "new_id"]
