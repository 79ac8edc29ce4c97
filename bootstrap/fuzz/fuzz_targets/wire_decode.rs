//! Any bytes, as a frame stream or a bare body: decoding returns a message
//! or a `WireError`, never panics; whatever decodes re-encodes identically.
#![no_main]

use std::io::Cursor;

use bootstrap::wire::{read_message, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut stream = Cursor::new(data);
    while read_message(&mut stream).is_ok() {}
    if let Ok(m) = Message::decode_body(data) {
        let frame = m.encode_frame();
        assert_eq!(&frame[4..], data);
    }
});
