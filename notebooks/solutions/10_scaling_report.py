"""Solutions to lesson 10's exercises. Run: python notebooks/solutions/10_scaling_report.py"""


def serial_fraction(speedup, n):
    """Exercise 1: Amdahl's serial share s from a measured speedup on n devices: speedup = 1 / (s + (1 - s) / n)."""
    if n < 2:
        raise ValueError("a serial fraction needs at least 2 devices")
    return (n / speedup - 1) / (n - 1)


def predicted_speedup(s, n):
    """Exercise 1: the speedup Amdahl's law predicts on n devices for a serial share s."""
    return 1 / (s + (1 - s) / n)


if __name__ == "__main__":
    s = serial_fraction(1.6, 2)
    print(f"a 1.6x speedup on 2 devices: serial share {s:.0%}; 8 devices would give {predicted_speedup(s, 8):.2f}x")
