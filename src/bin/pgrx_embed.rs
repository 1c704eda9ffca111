fn main() { pgrx::pgrx_embed!() }
