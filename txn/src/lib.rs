pub mod object;
pub mod ring;
