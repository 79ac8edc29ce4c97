pub mod history;
pub mod object;
pub mod ring;
